"""What a request costs on the robot's two devices (the cost view): the agent's side of the
scheduler contract (``sched.contract``). Builds the scheduler, turns the edge's health and
schedule into the state a plan is made against, turns what ran into an ``Outcome`` for
``Scheduler.observe``, and prices a request with the one energy account. ``CostView`` holds
what these need per prompt length (stand-in factors, roofline utilisation), built once.

The plan space holds one setting: the agent's configured one (identity by default), which the
agent then executes on both sides (``AccelSetting.hooks``), so a plan never promises a setting
that does not run. Its accuracy cost is whatever the user accepted by choosing it: it is
priced (analytic FLOPs), not measured, and the space's notes say so.

The edge's view is its committed schedule (``EdgeServer.schedule``: the batch running now and
every queued request's stages, whose robot, when, how long, due when), which comes with every
reply and health answer: each slot that will still run and is due no later than this request
(EDF serves those first) becomes a reservation the predictor places the request's edge stages
after (``edge_state``). Without one (an older edge), per-stage queue depth times the measured
stage time is the queued work.
"""

from __future__ import annotations

from vlarun.runtime.emulate import emulated_device, world_meter
from vlarun.runtime.robot.agent_config import AgentConfig
from vlarun.sched.calibration import Calibration
from vlarun.sched.catalog import Device, get_device
from vlarun.sched.contract import ExecutionPlan, Outcome, StageOutcome
from vlarun.sched.cost import roofline, stage_works
from vlarun.sched.energy import RadioPower, StageSpend, request_energy_by_device
from vlarun.sched.link import Link
from vlarun.sched.plans import build_space
from vlarun.sched.predictor import DeviceState
from vlarun.sched.queue_model import reservations
from vlarun.sched.scheduler import Scheduler
from vlarun.sched.settings_table import IDENTITY, SettingRow, carried_to, load_settings
from vlarun.stages.families import Workload


def role_devices(cfg: AgentConfig) -> dict[str, Device]:
    """The robot's and the edge's catalog devices, as emulated (rates scaled) where they are."""
    out = {}
    for role, side in (("robot", cfg.robot), ("edge", cfg.edge)):
        emu = side.emulation
        out[role] = emulated_device(emu) if emu is not None else get_device(side.device)
    return out


def cost_model(model_cfg, cfg: AgentConfig):
    """What the plan costs: the policy that runs, or the real model both sides emulate."""
    if cfg.robot.emulation is None:
        return model_cfg
    from vlarun.models.presets import get_preset

    return get_preset(cfg.robot.emulation.model)


# Knobs whose non-identity values are model transforms the runtime cannot execute yet: the
# robot and the edge run the checkpoint's own weights (``AccelSetting.hooks`` refuses int8).
RUNTIME_REFUSES = ("layers_kept", "weights")


def make_scheduler(model_cfg, cfg: AgentConfig, text_tokens: int, dtype: str) -> Scheduler:
    """The agent's scheduler between its robot and edge devices: placements under its one
    setting (``cfg.setting``; strategy "vlarun"), or placements x every setting the runtime can
    execute whose measured success clears the accuracy floor (strategy "vlarun-joint": the
    settings table ``cfg.settings_file`` or the shipped one; layer pruning and int8 weights
    are model transforms the runtime does not run (``AccelSetting.hooks`` refuses them), so
    those rows are left out)."""
    devices = role_devices(cfg)
    model_cfg = cost_model(model_cfg, cfg)
    if cfg.robot.emulation is not None:  # the real model in the emulated devices' dtype
        dtype = cfg.robot.emulation.dtype
    w = Workload(1, text_tokens, dtype)
    if cfg.strategy == "vlarun-joint":
        rows = tuple(
            r
            for r in load_settings(cfg.settings_file)
            if r.knob not in RUNTIME_REFUSES or r.value == IDENTITY[r.knob]
        )
        if cfg.robot.emulation is not None and cfg.settings_proxy:
            rows = carried_to(rows, model_cfg.name)
        floor = None if cfg.accuracy_floor == "none" else cfg.accuracy_floor
    else:
        rows = tuple(
            SettingRow(k, v, 1.0, "identity")
            if v == IDENTITY[k]
            else SettingRow(k, v, None, f"the run's setting {cfg.setting}")
            for k, v in {**IDENTITY, **cfg.setting.knobs()}.items()
        )
        floor = None
    space = build_space(model_cfg, stage_works(model_cfg, w), devices, w, floor, rows)
    # Batching is the edge's own business (its queues), not reserved here. Outcomes come back
    # (``RobotAgent.infer``), so a plan never run may be tried now and then (bounded
    # exploration): its cost is capped by the agent's timeout at deadline + one local run.
    # An emulated run's clock is 1 / time_scale slower than the emulated devices': what the
    # calibration forgets with time forgets on the emulated clock, as the link's memory does.
    stretch = 1.0 if cfg.robot.emulation is None else 1.0 / cfg.robot.emulation.time_scale
    cal = Calibration(half_life_s=Calibration.half_life_s * stretch)
    return Scheduler(
        space,
        devices,
        cfg.slo_s,
        dtype=dtype,
        actions=model_cfg.horizon,
        cal=cal,
        explore_every=EXPLORE_EVERY,
        on_time=cfg.on_time,
    )


EXPLORE_EVERY = 20  # decisions between two tried never-run plans, at most


HOST = "this-cpu"  # where the runtime's processes really run, robot and edge alike


def stand_in_factors(
    model_cfg, cfg: AgentConfig, text_tokens: int, dtype: str
) -> dict[str, dict[str, float]]:
    """Role -> stage -> seconds on the role's named device per second measured on this host.

    Every stage the runtime runs, runs here. When a role names another catalog device (a
    Jetson, an RTX 4090) this host stands in for it, and its measured times are converted
    before they are priced or taught to the scheduler: t_device = t_here x roofline(device) /
    roofline(here), i.e. the calibrated prediction for the named device (this host's
    calibration factor, measured / roofline, carries over). Time and power then always belong
    to the same device; never this CPU's milliseconds at a GPU's watts. 1.0 for ``this-cpu``."""
    host = get_device(HOST)
    works = stage_works(model_cfg, Workload(1, text_tokens, dtype))
    out = {}
    for role, side in (("robot", cfg.robot), ("edge", cfg.edge)):
        dev = get_device(side.device)
        out[role] = {  # an emulated side already takes its device's (scaled) time
            w.name: 1.0
            if dev.id == host.id or side.emulation is not None
            else roofline(w, dev, dtype).seconds / max(roofline(w, host, dtype).seconds, 1e-12)
            for w in works
        }
    return out


def roofline_utilisation(
    model_cfg, cfg: AgentConfig, text_tokens: int, dtype: str
) -> dict[str, dict]:
    """Role -> stage -> the roofline's utilisation of the role's device running the stage at
    batch 1 (the model the plan is costed for, on the devices as emulated): what the scheduler
    prices a stage's power at, so the runtime prices an executed stage at it too."""
    devices = role_devices(cfg)
    model_cfg = cost_model(model_cfg, cfg)
    if cfg.robot.emulation is not None:
        dtype = cfg.robot.emulation.dtype
    works = stage_works(model_cfg, Workload(1, text_tokens, dtype))
    return {
        role: {w.name: roofline(w, dev, dtype).utilisation for w in works}
        for role, dev in devices.items()
    }


def convert(times: dict[str, float], factors: dict[str, float]) -> dict[str, float]:
    return {name: t * factors.get(name, 1.0) for name, t in times.items()}


def prime(
    sched: Scheduler, robot_s: dict[str, float], edge_ms: dict[str, float], factors: dict
) -> None:
    """Start calibrated: stage times already measured (the robot's warm-up runs, the edge's
    per-stage estimates from its health reply), converted to the named devices, set the stage
    factors before the first request, so the first plan is not a guess from catalog peaks."""
    edge_s = {name: ms * 1e-3 for name, ms in edge_ms.items()}
    sched.prime(convert(robot_s, factors["robot"]), convert(edge_s, factors["edge"]))


def edge_state(health: dict, schedule=None, age_s: float = 0.0) -> DeviceState:
    """The edge's load for a request made now: the edge's committed schedule (a sequence of
    ``bookings.Slot``, times from when it was sent, ``age_s`` ago) as reservations with their
    deadlines, or else its queue depth x measured stage times."""
    if schedule:
        # Times relative to the request's start (now = 0): a slot ended by then is done.
        return DeviceState(reservations=reservations(s.since(age_s) for s in schedule))
    stage_ms = health.get("stage_ms", {}) or {}
    queue = health.get("queue", {}) or {}
    return DeviceState(queued_s={s: n * stage_ms.get(s, 0.0) * 1e-3 for s, n in queue.items()})


def decide(
    sched: Scheduler, link: Link, health: dict, schedule=None, age_s: float = 0.0
) -> ExecutionPlan:
    """The scheduler's decision for a request made now, given the edge's last health reply
    and its committed schedule (``age_s`` old)."""
    state = edge_state(health, schedule, age_s)
    return sched.decide(link, 0.0, state, top=0)


def outcome(
    inf, stage_s: dict[str, float], batch: dict[str, int], factors: dict, transfers=()
) -> Outcome:
    """The plan contract's Outcome of one executed request: per stage where it ran, its
    execution time (an edge batch's whole compute time, which this request waited for) and
    the batch it ran in, all converted to the named devices (``stand_in_factors``); and each
    edge call's time off the edge (``TransferOutcome``: the boundaries it crossed)."""
    stages = tuple(
        StageOutcome(name, role, stage_s[name] * factors[role].get(name, 1.0), batch.get(name, 1))
        for name, role in inf.ran.items()
        if name in stage_s
    )
    latency = _converted_latency(inf.latency_s, inf.ran, stage_s, factors)
    return Outcome(stages, latency, inf.fallback, inf.energy_j, transfers=tuple(transfers))


def _converted_latency(latency_s: float, ran: dict, stage_s: dict, factors: dict) -> float:
    """The request's latency with each stage's time replaced by its named device's."""
    delta = sum(stage_s[n] * (factors[r].get(n, 1.0) - 1.0) for n, r in ran.items() if n in stage_s)
    return max(latency_s + delta, 0.0)


def modelled_energy(cfg: AgentConfig, *args, **kwargs) -> float:
    """:func:`modelled_energy_by_device`, summed: the energy of one executed request."""
    return sum(modelled_energy_by_device(cfg, *args, **kwargs).values())


def modelled_energy_by_device(
    cfg,
    ran: dict,
    stage_s: dict,
    edge_s: dict,
    latency_s: float,
    factors: dict,
    radio: RadioPower | None = None,
    utilisation: dict[str, dict[str, float]] | None = None,
    wasted: dict[str, float] | None = None,
    devices: dict[str, Device] | None = None,
) -> dict[str, float]:
    """Energy of one executed request per device: ``request_energy_by_device`` (the
    scheduler's own account) on its
    measured times. A stage is priced at ``utilisation[role][name]`` (the roofline's estimate
    for the device it ran on, ``roofline_utilisation``: what the scheduler priced it at, so an
    outcome that ran its plan in the predicted times costs what the plan predicted), else at
    full utilisation (an upper bound of the dynamic part). Edge stages are charged their
    per-request compute time (``edge_s``), the radio the request's remote time that was not
    edge compute, half sending and half receiving.

    ``wasted``: robot stages that ran here and were then redone on the edge (a handoff): the
    robot was busy for them all the same.

    The devices are ``devices`` (a world's meter) or ``cfg.robot.device`` / ``cfg.edge.device``;
    times measured on this host
    are first converted to them (``stand_in_factors``: 1.0 for ``this-cpu``, the default)."""
    devices = devices or role_devices(cfg)
    wasted = wasted or {}
    rob, edge = devices["robot"], devices["edge"]
    f_rob, f_edge = factors["robot"], factors["edge"]
    util = utilisation or {}
    spends = [
        StageSpend(
            role,
            stage_s[name] * f_rob.get(name, 1.0)
            if role == "robot"
            else edge_s.get(name, 0.0) * f_edge.get(name, 1.0),
            util.get(role, {}).get(name, 1.0),
        )
        for name, role in ran.items()
    ]
    spends += [
        StageSpend("robot", t * f_rob.get(name, 1.0), util.get("robot", {}).get(name, 1.0))
        for name, t in wasted.items()
    ]
    remote = [n for n, r in ran.items() if r == "edge"]
    on_air = 0.0
    listen = sum(stage_s[n] for n in remote)  # the robot waits for the edge's stages
    if remote:  # the link's time is the link's: measured, never converted
        robot_busy = sum(stage_s[n] for n in ran if ran[n] == "robot") + sum(wasted.values())
        on_air = max(latency_s - robot_busy - sum(stage_s[n] for n in remote), 0.0)
    latency = _converted_latency(latency_s, ran, stage_s, factors)
    latency += sum(t * (f_rob.get(n, 1.0) - 1.0) for n, t in wasted.items())
    return request_energy_by_device(
        rob,
        edge,
        spends,
        latency_s=latency,
        period_s=cfg.slo_s,
        tx_s=on_air / 2,
        rx_s=on_air / 2,
        radio=radio or RadioPower(),
        listen_s=listen,
    )


class CostView:
    """The costs of one robot's requests, per prompt length (``text_tokens``): the stand-in
    factors from this host to the named devices, the roofline utilisation each stage is priced
    at, and the energy of what ran. Emulated under a world other than the catalog, the world
    is the meter (``runtime.emulate.world_meter``): the same account with the world's powers
    on the emulated times, so a power the scheduler has wrong is not priced its way."""

    def __init__(self, model_cfg, cfg: AgentConfig, dtype: str) -> None:
        self.model_cfg, self.cfg, self.dtype = model_cfg, cfg, dtype
        # (name, devices, radio), or None: the catalog prices
        self.world = world_meter(cfg.robot, cfg.edge)
        self._factors: dict[int, dict] = {}
        self._utilisation: dict[int, dict] = {}

    def factors(self, text_tokens: int) -> dict[str, dict[str, float]]:
        """Measured-here to named-device time factors (``stand_in_factors``), built once."""
        if text_tokens not in self._factors:
            self._factors[text_tokens] = stand_in_factors(
                self.model_cfg, self.cfg, text_tokens, self.dtype
            )
        return self._factors[text_tokens]

    def scheduler(self, text_tokens: int) -> Scheduler:
        """A new scheduler for prompts of ``text_tokens`` (``make_scheduler``), unprimed."""
        return make_scheduler(self.model_cfg, self.cfg, text_tokens, self.dtype)

    def energy(
        self,
        text_tokens: int,
        ran: dict,
        stage_s: dict,
        edge_s: dict,
        latency_s: float,
        wasted: dict | None = None,
    ) -> tuple[dict, dict]:
        """(metered, modelled): what ran, per device (``modelled_energy_by_device``). Modelled
        is the scheduler's own account, each stage at the roofline utilisation it prices it
        at on the device it ran on (every strategy alike); metered is the world's powers where
        a world is the meter, else empty (no meter read it: the model is all there is). Their
        ratio per device is the device's power error on this execution."""
        if text_tokens not in self._utilisation:
            self._utilisation[text_tokens] = roofline_utilisation(
                self.model_cfg, self.cfg, text_tokens, self.dtype
            )
        modelled = modelled_energy_by_device(
            self.cfg,
            ran,
            stage_s,
            edge_s,
            latency_s,
            self.factors(text_tokens),
            utilisation=self._utilisation[text_tokens],
            wasted=wasted,
        )
        if self.world is None:
            return {}, modelled
        _, devices, radio = self.world
        ones = {"robot": {}, "edge": {}}
        metered = modelled_energy_by_device(
            self.cfg,
            ran,
            stage_s,
            edge_s,
            latency_s,
            ones,
            radio=radio,
            wasted=wasted,
            devices=devices,
        )
        return metered, modelled
